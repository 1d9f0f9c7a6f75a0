//! Scale-set pools: a GitHub pool that names a runner scale set learns its
//! jobs from the scale set's message queue (`docs/github.md`).
//!
//! One listener per such pool, on the leader only. Each round it makes sure
//! the scale set exists with the pool's labels (creating it, or again after
//! GitHub deleted it), holds the scale set's one message session (replacing
//! a stale session runway itself left, recorded in the store; waiting out,
//! with backoff, one held by someone else), and long-polls one message.
//! A message's effects go into the store before it is acknowledged, and
//! each applies idempotently, so a kill between the two redelivers it and
//! nothing happens twice:
//!
//! - `JobAvailable`: the job is acquired (`acquirejobs`) and stored as a
//!   queued GitHub job of the pool (keyed by its runner request);
//! - `JobAssigned`: stored if it is not (it was acquired);
//! - `JobStarted`: the named runner is busy with the job (never removed
//!   while it is);
//! - `JobCompleted`: the job ends with its result; its ephemeral runner goes.
//!
//! From there on the job is like a webhook's: routing, the planner's
//! demand, "why is my job waiting?", metrics and the admin API.

mod words;

use words::*;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use runway_core::github::WorkflowJobAction;
use runway_core::Timestamp;

use crate::app::Service;
use crate::config::PoolGithub;
use crate::github::api::{GithubClient, GithubError};
use crate::github::payload::{ScaleSetOrigin, WorkflowJob};
use crate::github::scaleset::{
    status_of, JobInfo, JobMessage, Message, PoolScaleSet, ScaleSetClient, Session, Statistics,
};
use crate::telemetry::metrics::PoolKindLabels;

/// The pause between rounds (each is one long poll) while they succeed;
/// failures back off from it, doubling up to a minute.
const ROUND_PAUSE: Duration = Duration::from_millis(100);

/// One scale-set pool's listener.
struct Listener {
    service: Arc<Service>,
    pool: String,
    handle: Arc<PoolScaleSet>,
    session: Option<Session>,
    /// The last message stored in this session.
    last: i64,
    /// The settings the scale set was last found or made with.
    ensured: Option<(PoolGithub, Vec<String>)>,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Listener {
    fn metric(&self, family: &Family<PoolKindLabels, Counter>, kind: &'static str) {
        family
            .get_or_create(&PoolKindLabels {
                pool: self.pool.clone(),
                kind,
            })
            .inc();
    }

    fn client(&self) -> &ScaleSetClient {
        &self.handle.client
    }

    /// The pool's GitHub settings if it still names a scale set.
    fn github(&self) -> Option<(PoolGithub, Vec<String>, u32)> {
        let config = self.service.config();
        let pool = config.pool(&self.pool)?;
        let github = pool.github.clone().filter(|g| g.scale_set.is_some())?;
        Some((github, pool.labels.clone(), pool.max_runners))
    }

    async fn round(&mut self) -> Result<(), String> {
        let Some((github, labels, max_runners)) = self.github() else {
            // A reload took the scale set away: let go of the session.
            self.close().await;
            return Ok(());
        };
        // A session, an acquisition and an acknowledgement are the
        // leader's to make: a listener of a replica that cannot show it
        // still leads makes none.
        self.service
            .may_act("scale_set")
            .await
            .map_err(|deposed| deposed.to_string())?;
        // Found once, and again when GitHub lost it or a reload changed
        // what it should be.
        let settings = (github.clone(), labels.clone());
        let scale_set_id = match self.handle.id() {
            Some(id) if self.ensured.as_ref() == Some(&settings) => id,
            _ => {
                let id = self.ensure_scale_set(&github, &labels).await?;
                self.ensured = Some(settings);
                id
            }
        };
        if self
            .session
            .as_ref()
            .is_some_and(|s| s.scale_set_id != scale_set_id)
        {
            self.close().await; // The pool's scale set is another one now.
        }
        if self.session.is_none() {
            self.open_session(scale_set_id).await?;
        }
        self.poll(max_runners).await
    }

    /// Finds the scale set (creating it, or bringing its labels and group
    /// to the pool's) and publishes its id to the reconciler.
    async fn ensure_scale_set(
        &mut self,
        github: &PoolGithub,
        labels: &[String],
    ) -> Result<i64, String> {
        let metrics = &self.service.metrics;
        let name = github.scale_set.clone().unwrap_or_default();
        let group = match &github.runner_group {
            Some(group) => self
                .client()
                .runner_group_id(metrics, group)
                .await
                .map_err(|e| format!("runner group {group:?}: {e}"))?,
            None => github.runner_group_id as i64,
        };
        let wanted = scale_set_labels(&name, labels);
        let found = self
            .client()
            .find_scale_set(metrics, &name, group)
            .await
            .map_err(|e| e.to_string())?;
        let set = match found {
            Some(set) if same_labels(&set.labels, &wanted) => set,
            Some(set) => {
                tracing::info!(pool = %self.pool, scale_set = %name, id = set.id, labels = ?wanted, "updating the scale set's labels to the pool's");
                self.client()
                    .put_scale_set(metrics, Some(set.id), &name, group, &wanted)
                    .await
                    .map_err(|e| e.to_string())?
            }
            None => {
                let set = self
                    .client()
                    .put_scale_set(metrics, None, &name, group, &wanted)
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(pool = %self.pool, scale_set = %name, id = set.id, labels = ?wanted, "created the scale set");
                self.end_jobs_of_a_deleted_scale_set().await?;
                set
            }
        };
        self.handle.set_id(Some(set.id));
        Ok(set.id)
    }

    /// Ends the pool's queued jobs when its scale set had to be created:
    /// they came from a scale set GitHub has since deleted with its jobs
    /// (a scale-set pool's jobs come only from its queue), and no queue
    /// will bring them again; left queued they would keep runners warm for
    /// jobs that no longer exist. Each is cancelled, saying why (audited).
    async fn end_jobs_of_a_deleted_scale_set(&self) -> Result<(), String> {
        let reason = "its scale set was deleted at GitHub, with its jobs";
        let mut ended = 0;
        loop {
            let queued = self
                .service
                .store
                .list_jobs(&runway_store::JobFilter {
                    pool: Some(self.pool.clone()),
                    state: Some(runway_core::JobState::Queued),
                    limit: Some(500),
                    ..runway_store::JobFilter::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            if queued.is_empty() {
                break;
            }
            let mut progress = false;
            for job in queued {
                match crate::app::admin::cancel_job(
                    &self.service,
                    "scale-set listener",
                    job.id,
                    Some(reason.to_owned()),
                )
                .await
                {
                    Ok(_) => {
                        ended += 1;
                        progress = true;
                    }
                    Err(error) => {
                        tracing::warn!(pool = %self.pool, job = %job.id, %error, "cannot end a job of a deleted scale set")
                    }
                }
            }
            if !progress {
                break;
            }
        }
        if ended > 0 {
            tracing::warn!(pool = %self.pool, jobs = ended, "ended the queued jobs of a scale set GitHub deleted");
        }
        Ok(())
    }

    /// Opens the scale set's session. A session runway left behind (a
    /// crash, a leader that lost its lead) is deleted first; one held by
    /// another listener is waited out (the round fails, so the worker
    /// backs off and `GET /api/v1/tasks` says why).
    async fn open_session(&mut self, scale_set_id: i64) -> Result<(), String> {
        let (service, metrics) = (&self.service, &self.service.metrics);
        let key = session_key(&self.pool);
        let stale = service
            .store
            .get_setting(&key)
            .await
            .map_err(|e| e.to_string())?;
        if let Some((set, id)) = stale.as_deref().and_then(|s| s.split_once(':')) {
            if let Ok(set) = set.parse::<i64>() {
                match self.client().delete_session(metrics, set, id).await {
                    // Already gone (GitHub dropped it): nothing replaced.
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(pool = %self.pool, session = %id, "replaced the message session runway held before");
                        self.metric(&metrics.scale_set_sessions, "replaced");
                    }
                    Err(error) => {
                        tracing::warn!(pool = %self.pool, %error, "cannot delete the message session runway held before");
                    }
                }
            }
        }
        let owner = format!("runway-{}", service.replica);
        match self
            .client()
            .create_session(metrics, scale_set_id, &owner)
            .await
        {
            Ok(session) => {
                service
                    .store
                    .put_setting(&key, &format!("{scale_set_id}:{}", session.id))
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(pool = %self.pool, scale_set = scale_set_id, session = %session.id, "message session open");
                self.metric(&metrics.scale_set_sessions, "opened");
                if let Some(statistics) = &session.statistics {
                    self.observe(statistics);
                }
                self.session = Some(session);
                self.handle.set_session(true);
                self.last = 0;
                Ok(())
            }
            Err(error) if status_of(&error) == Some(409) => {
                self.metric(&metrics.scale_set_sessions, "conflict");
                tracing::warn!(pool = %self.pool, scale_set = scale_set_id, "the scale set's message session is held by another listener; waiting for it to end");
                Err(format!(
                    "scale set {scale_set_id} already has a message session (another listener, or one GitHub has not ended yet); retrying with backoff"
                ))
            }
            Err(error) if status_of(&error) == Some(404) => {
                self.handle.set_id(None);
                Err(format!(
                    "scale set {scale_set_id} is gone; finding or creating it again"
                ))
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// One long poll; a message is applied, then acknowledged.
    async fn poll(&mut self, max_runners: u32) -> Result<(), String> {
        let Some(session) = self.session.clone() else {
            return Ok(());
        };
        // Room made since the last message (a job cancelled here, a
        // reload that raised max_runners) is used before the long poll.
        self.acquire(&session, max_runners).await?;
        let metrics = &self.service.metrics;
        let mut shutdown = self.shutdown.clone();
        let polled = tokio::select! {
            polled = self.client().get_message(metrics, &session, self.last, max_runners) => polled,
            // Shutdown during a long poll: nothing was received, so
            // nothing is lost by dropping it (a message in flight stays
            // unacknowledged and comes again).
            () = async {
                let _ = shutdown.wait_for(|stop| *stop).await;
            } => return Ok(()),
        };
        let message = match polled {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(error) => return self.poll_failed(&session, error).await,
        };
        self.metric(&metrics.scale_set_messages, "received");
        if let Some(statistics) = &message.statistics {
            self.observe(statistics);
        }
        self.apply(&message).await?;
        // What the message changed (jobs available, started, ended) may
        // give the pool room to acquire.
        self.acquire(&session, max_runners).await?;
        // Stored: the next poll asks for what follows it, even if the
        // acknowledgement fails (then a later session may get it again,
        // which changes nothing).
        self.last = message.id;
        self.service
            .may_act("scale_set_acknowledge")
            .await
            .map_err(|deposed| deposed.to_string())?;
        self.client()
            .delete_message(metrics, &session, message.id)
            .await
            .map_err(|e| e.to_string())?;
        self.metric(&metrics.scale_set_messages, "acknowledged");
        Ok(())
    }

    async fn poll_failed(&mut self, session: &Session, error: GithubError) -> Result<(), String> {
        let metrics = &self.service.metrics;
        if let GithubError::Budget { retry_at, .. } = error {
            // Rate-limited: no call of this pool before GitHub's wait is
            // over (the client holds them all back meanwhile).
            self.wait_until(retry_at).await;
            return Ok(());
        }
        match status_of(&error) {
            Some(401) => {
                // The queue token expired: a new one for the same session
                // (only a 401 means that; a 403 is a refusal or a limit).
                match self.client().refresh_session(metrics, session).await {
                    Ok(fresh) => {
                        tracing::info!(pool = %self.pool, "message queue token refreshed");
                        self.session = Some(fresh);
                        Ok(())
                    }
                    Err(error) if status_of(&error) == Some(404) => {
                        self.lost_session();
                        Ok(())
                    }
                    Err(error) => Err(error.to_string()),
                }
            }
            Some(404) => {
                self.lost_session();
                Ok(())
            }
            _ => Err(error.to_string()),
        }
    }

    /// Waits until `until` (or shutdown).
    async fn wait_until(&self, until: Timestamp) {
        let wait = until.since(crate::clock::now());
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }

    /// GitHub dropped the session (it timed out, or the scale set was
    /// deleted): the next round checks the scale set and opens a new one.
    fn lost_session(&mut self) {
        tracing::warn!(pool = %self.pool, "the message session is gone; opening a new one");
        self.metric(&self.service.metrics.scale_set_sessions, "lost");
        self.session = None;
        self.handle.set_session(false);
        self.handle.set_id(None);
    }

    fn observe(&self, statistics: &Statistics) {
        self.handle.observe(statistics, crate::clock::now());
        let metrics = &self.service.metrics;
        let label = |kind| PoolKindLabels {
            pool: self.pool.clone(),
            kind,
        };
        for (kind, value) in [
            ("available", statistics.total_available_jobs),
            ("acquired", statistics.total_acquired_jobs),
            ("assigned", statistics.total_assigned_jobs),
            ("running", statistics.total_running_jobs),
        ] {
            metrics
                .scale_set_jobs
                .get_or_create(&label(kind))
                .set(value);
        }
        for (kind, value) in [
            ("registered", statistics.total_registered_runners),
            ("busy", statistics.total_busy_runners),
            ("idle", statistics.total_idle_runners),
        ] {
            metrics
                .scale_set_runners
                .get_or_create(&label(kind))
                .set(value);
        }
    }

    /// Stores what a message says. Any store failure fails the round, so
    /// the message is not acknowledged and comes again.
    async fn apply(&self, message: &Message) -> Result<(), String> {
        let now = crate::clock::now();
        for job in &message.jobs {
            let (action, info, runner, result) = match job {
                // Stored, not yet acquired: `acquire` takes the pool's
                // jobs in fair-share order as it has room.
                JobMessage::Available(info) => (WorkflowJobAction::Queued, info, None, None),
                JobMessage::Assigned(info) => (WorkflowJobAction::Queued, info, None, None),
                JobMessage::Started { runner_name, job } => (
                    WorkflowJobAction::InProgress,
                    job,
                    Some(runner_name.clone()),
                    None,
                ),
                JobMessage::Completed {
                    result,
                    runner_name,
                    job,
                } => (
                    WorkflowJobAction::Completed,
                    job,
                    Some(runner_name.clone()).filter(|n| !n.is_empty()),
                    Some(conclusion(result)),
                ),
                JobMessage::Other(kind) => {
                    tracing::debug!(pool = %self.pool, %kind, "a job message runway does not act on");
                    continue;
                }
            };
            if action == WorkflowJobAction::InProgress
                && runner.as_deref().is_none_or(str::is_empty)
            {
                tracing::warn!(pool = %self.pool, request = info.runner_request_id, "JobStarted without a runner name; ignored");
                continue;
            }
            let Ok(request) = u64::try_from(info.runner_request_id) else {
                continue;
            };
            let acquired = !matches!(job, JobMessage::Available(_));
            let payload = self.workflow_job(action, request, info, runner, result, now, acquired);
            let applied = if action == WorkflowJobAction::Queued {
                crate::app::intake::receive(&self.service, &payload, action, None, now)
                    .await
                    .map(|applied| applied.outcome)
            } else {
                crate::app::intake::apply_observed(&self.service, &payload, action, now).await
            };
            let outcome = applied.map_err(|e| format!("storing job {request}: {e}"))?;
            tracing::debug!(pool = %self.pool, request, action = action.as_str(), outcome = outcome.as_str(), "scale-set job message applied");
            if matches!(job, JobMessage::Assigned(_)) {
                // Acquired (by this listener before a crash, say): stored
                // as such if runway had it as not yet acquired.
                self.mark_acquired(&payload.external_id()).await?;
            }
        }
        Ok(())
    }

    /// Acquires the pool's stored jobs that are not yet acquired, in its
    /// fair-share order (the queue order, `runway_core::share`), as many as
    /// the pool has room for: `max_runners` less its jobs running and
    /// those acquired and not yet running (GitHub gives an acquired job to
    /// the scale set's next idle runner, in its own order, so what runway
    /// acquires is what it chooses to run next). A key at the pool's cap
    /// on running jobs (`[pools.share] max_running`) is passed over. A job
    /// GitHub no longer offers (another scale set took it, or it ended)
    /// ends here.
    async fn acquire(&self, session: &Session, max_runners: u32) -> Result<(), String> {
        let store = &self.service.store;
        let queued = store
            .list_jobs(&runway_store::JobFilter {
                pool: Some(self.pool.clone()),
                state: Some(runway_core::JobState::Queued),
                limit: Some(crate::app::explain::LISTED_QUEUE),
                ..runway_store::JobFilter::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let (waiting, held): (Vec<&runway_core::Job>, Vec<&runway_core::Job>) =
            queued.iter().partition(|job| {
                crate::app::intake::GithubFacts::parse(&job.payload).acquired == Some(false)
            });
        if waiting.is_empty() {
            return Ok(());
        }
        let counts = store
            .share_counts(&self.pool)
            .await
            .map_err(|e| e.to_string())?;
        let mut active = runway_store::ShareCount::active_by_key(&counts);
        for job in &held {
            *active.entry(job.share.key.clone()).or_default() += 1;
        }
        let taken: u32 = active.values().sum();
        let room = max_runners.saturating_sub(taken) as usize;
        if room == 0 {
            return Ok(());
        }
        let cap = self
            .service
            .config()
            .pool(&self.pool)
            .and_then(|pool| pool.max_running_per_key())
            .unwrap_or(u32::MAX);
        let (stay, _) = runway_core::planner::hold_by_cap(
            waiting.iter().map(|job| (job.id, job.share.key.as_str())),
            &active,
            cap,
        );
        let picks: Vec<(&runway_core::Job, i64)> = stay
            .into_iter()
            .take(room)
            .filter_map(|i| {
                let job = waiting[i];
                let request = job.external_id.strip_prefix("rr-")?.parse().ok()?;
                Some((job, request))
            })
            .collect();
        if picks.is_empty() {
            return Ok(());
        }
        self.service
            .may_act("scale_set_acquire")
            .await
            .map_err(|deposed| deposed.to_string())?;
        let requests: Vec<i64> = picks.iter().map(|(_, request)| *request).collect();
        let acquired: BTreeSet<i64> = self
            .client()
            .acquire_jobs(&self.service.metrics, session, &requests)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
        for (job, request) in picks {
            if acquired.contains(&request) {
                tracing::debug!(pool = %self.pool, request, key = %job.share.key, "acquired a job");
                self.mark_acquired(&job.external_id).await?;
            } else {
                tracing::info!(pool = %self.pool, request, "a job went to another scale set, or ended, before runway acquired it");
                if let Err(error) = crate::app::admin::cancel_job(
                    &self.service,
                    "scale-set listener",
                    job.id,
                    Some("GitHub no longer offered it to this scale set (another scale set took it, or it ended) when runway acquired it".to_owned()),
                )
                .await
                {
                    tracing::warn!(pool = %self.pool, job = %job.id, %error, "cannot end a job the scale set lost");
                }
            }
        }
        Ok(())
    }

    /// Records that the pool's job `external_id` is acquired (if it is
    /// stored as not yet acquired; a change that loses a race is left for
    /// the next round, which asks GitHub again — acquiring twice is
    /// harmless).
    async fn mark_acquired(&self, external_id: &str) -> Result<(), String> {
        let store = &self.service.store;
        let Some(job) = store
            .find_job(runway_core::JobSource::Github, external_id)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let mut facts: serde_json::Value =
            serde_json::from_str(&job.payload).unwrap_or(serde_json::Value::Null);
        let Some(object) = facts.as_object_mut() else {
            return Ok(());
        };
        if object.remove("acquired").is_none() {
            return Ok(());
        }
        let next = runway_core::Job {
            payload: facts.to_string(),
            version: job.version + 1,
            ..job.clone()
        };
        store
            .replace_job(&job, &next)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn workflow_job(
        &self,
        action: WorkflowJobAction,
        request: u64,
        info: &JobInfo,
        runner_name: Option<String>,
        conclusion: Option<String>,
        now: Timestamp,
        acquired: bool,
    ) -> WorkflowJob {
        let time = |text: &Option<String>| text.as_deref().and_then(crate::github::api::parse_time);
        let repository = (!info.owner_name.is_empty() && !info.repository_name.is_empty())
            .then(|| format!("{}/{}", info.owner_name, info.repository_name));
        WorkflowJob {
            action: action.as_str().to_owned(),
            job_id: request,
            run_id: u64::try_from(info.workflow_run_id)
                .ok()
                .filter(|id| *id > 0),
            name: Some(info.job_display_name.clone()).filter(|n| !n.is_empty()),
            labels: info.request_labels.clone(),
            runner_name,
            conclusion,
            repository,
            workflow: workflow_of(&info.job_workflow_ref),
            created_at: time(&info.queue_time),
            started_at: (action == WorkflowJobAction::InProgress).then_some(now),
            completed_at: time(&info.finish_time),
            scale_set: Some(ScaleSetOrigin {
                pool: self.pool.clone(),
                acquired,
            }),
        }
    }

    /// Lets go of the session (shutdown, lost lead, a reload that took the
    /// scale set away), so the next listener need not wait for it.
    async fn close(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        self.handle.set_session(false);
        let metrics = &self.service.metrics;
        match self
            .client()
            .delete_session(metrics, session.scale_set_id, &session.id)
            .await
        {
            Ok(_) => {
                self.metric(&metrics.scale_set_sessions, "closed");
                tracing::info!(pool = %self.pool, session = %session.id, "message session closed");
                let _ = self
                    .service
                    .store
                    .put_setting(&session_key(&self.pool), "")
                    .await;
            }
            Err(error) => {
                tracing::warn!(pool = %self.pool, %error, "cannot close the message session; the next leader replaces it");
            }
        }
    }
}

/// How often the supervisor looks for scale-set pools a reload added.
const NEW_POOLS_RECHECK: Duration = Duration::from_secs(1);

/// Runs a listener for every scale-set pool of the config until shutdown,
/// and one for each a reload adds (within a second). A listener stays
/// bound to the target it started with: a reload that moves a pool's scale
/// set to another organisation needs a restart (the reload says so).
pub async fn run(
    service: Arc<Service>,
    github: Arc<GithubClient>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut started = std::collections::BTreeSet::new();
    let mut listeners = tokio::task::JoinSet::new();
    loop {
        for pool in &service.config().pools {
            let Some(settings) = pool.github.as_ref().filter(|g| g.scale_set.is_some()) else {
                continue;
            };
            if !started.insert(pool.name.clone()) {
                continue;
            }
            let handle = service.scale_sets.get_or_insert(&pool.name, || {
                PoolScaleSet::new(ScaleSetClient::new(
                    github.clone(),
                    settings.target.clone(),
                    &pool.name,
                ))
            });
            let Some(handle) = handle else {
                continue;
            };
            listeners.spawn(listen(
                service.clone(),
                pool.name.clone(),
                handle,
                shutdown.clone(),
            ));
        }
        let stop = async {
            // The guard `wait_for` returns must not live across an await.
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        tokio::select! {
            () = stop => break,
            () = tokio::time::sleep(NEW_POOLS_RECHECK) => {}
        }
    }
    while listeners.join_next().await.is_some() {}
}

async fn listen(
    service: Arc<Service>,
    pool: String,
    handle: Arc<PoolScaleSet>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    // Named per pool in `GET /api/v1/tasks`; the pools are the config's,
    // so the names are few and live as long as the process.
    let name: &'static str = Box::leak(format!("github_scale_set:{pool}").into_boxed_str());
    let listener = tokio::sync::Mutex::new(Listener {
        service: service.clone(),
        pool,
        handle,
        session: None,
        last: 0,
        ensured: None,
        shutdown: shutdown.clone(),
    });
    let leading = || service.is_leader();
    crate::tasks::Worker {
        name,
        period: ROUND_PAUSE,
        leader_only: false,
        first_round_at_once: true,
        wake: None,
    }
    .run(&service.tasks, &leading, shutdown, || async {
        let mut listener = listener.lock().await;
        if !listener.service.is_leader() {
            // Only the leader holds the session.
            listener.close().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Ok(());
        }
        listener.round().await
    })
    .await;
    listener.lock().await.close().await;
}

#[cfg(test)]
mod tests;
