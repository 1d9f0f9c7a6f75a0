//! Pools' access policies at intake: the facts of a job's workflow run
//! (looked up once per run at GitHub, kept in a bounded cache), and the
//! first pool serving the job's labels whose policy admits it. The
//! decision itself is `runway_core::access`'s.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;

use runway_core::access::{first_admitting, Access, Refusal, Rule, RunFacts, Verdict};

use crate::app::{AccessPolicies, Service};
use crate::github::payload::WorkflowJob;
use runway_core::github_budget::Priority;

/// How many runs' facts are kept: a run's jobs arrive within minutes, so
/// this is many hours of runs, in a few hundred kilobytes.
const CACHED_RUNS: usize = 4_096;

/// Facts of workflow runs, by `(repository, run id)`, oldest dropped first.
/// Only successful lookups are kept: a failed one is asked again by the
/// next job of the run (within the request budget).
/// A run: `(repository, run id)`; its facts: `(event, fork)`.
type RunKey = (String, u64);
type Facts = (String, bool);

/// A bounded map of runs to what is known of them, oldest dropped first.
pub struct RunCache<V> {
    inner: Mutex<(BTreeMap<RunKey, V>, VecDeque<RunKey>)>,
}

impl<V> Default for RunCache<V> {
    fn default() -> Self {
        RunCache {
            inner: Mutex::new((BTreeMap::new(), VecDeque::new())),
        }
    }
}

impl<V: Clone> RunCache<V> {
    fn get(&self, key: &RunKey) -> Option<V> {
        self.inner.lock().ok()?.0.get(key).cloned()
    }

    fn put(&self, key: RunKey, value: V) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let (map, order) = &mut *inner;
        if map.insert(key.clone(), value).is_none() {
            order.push_back(key);
        }
        while order.len() > CACHED_RUNS {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }
}

/// Runs' `(event, fork)` as GitHub gave them.
pub type RunFactsCache = RunCache<Facts>;

/// Runs' triggering events as runners reported them (pre-job), and the
/// runs whose event is being looked up (so a fan-out of thirty jobs asks
/// once).
#[derive(Default)]
pub struct RunEvents {
    reported: RunCache<String>,
    asking: Mutex<BTreeSet<RunKey>>,
}

/// Where a job whose labels several pools serve goes, once their access
/// policies have judged it.
pub enum Admitted {
    /// The first candidate that admits it, and those that refused before.
    Pool(String, Vec<Refusal>),
    /// Every candidate refused.
    Refused(Vec<Refusal>),
    /// Every candidate refused, and one of them only because the run's
    /// event or origin could not be learned (GitHub down, the request
    /// budget spent): not a decision yet.
    Unknown(Vec<Refusal>),
}

/// The facts of a run of `repository`: its event and origin from GitHub
/// when `needed` (cached per run; unknown when GitHub cannot say now).
async fn run_facts(
    service: &Service,
    repository: Option<&str>,
    run_id: Option<u64>,
    needed: bool,
) -> RunFacts {
    let mut facts = RunFacts {
        repository: repository.map(str::to_owned),
        event: None,
        fork: None,
    };
    let (Some(repository), Some(run_id), true) = (repository, run_id, needed) else {
        return facts;
    };
    let key = (repository.to_lowercase(), run_id);
    let known = match service.run_facts.get(&key) {
        Some(known) => Some(known),
        None => match &service.github {
            Some(github) => match github
                .get_run(&service.metrics, repository, run_id, Priority::RunFacts)
                .await
            {
                Ok(run) => {
                    let known = (run.event, run.fork);
                    service.run_facts.put(key, known.clone());
                    Some(known)
                }
                Err(error) => {
                    tracing::warn!(%error, repository, run_id, "cannot look the workflow run up: pools that need its event or origin refuse its jobs");
                    None
                }
            },
            None => None,
        },
    };
    if let Some((event, fork)) = known {
        facts.event = Some(event);
        facts.fork = Some(fork);
    }
    facts
}

/// The triggering event (`push`, `pull_request`, `schedule`, …) of a run
/// of `repository`, if known here: looked up at GitHub (for a pool's
/// policy, or by [`learn_event`]) or reported by a runner's pre-job
/// report. What the event log's `github_event` and the `event` label say.
pub fn known_event(
    service: &Service,
    repository: Option<&str>,
    run_id: Option<u64>,
) -> Option<String> {
    let key = (repository?.to_lowercase(), run_id?);
    service
        .run_facts
        .get(&key)
        .map(|(event, _)| event)
        .or_else(|| service.run_events.reported.get(&key))
}

/// A runner reported `event` for the run (its pre-job report): later jobs
/// and webhooks of the run are labelled with it.
pub fn remember_event(service: &Service, repository: &str, run_id: u64, event: &str) {
    service
        .run_events
        .reported
        .put((repository.to_lowercase(), run_id), event.to_owned());
}

/// Looks the run's event up in the background if nothing here knows it
/// yet, so the job's start and end are labelled with it: one request per
/// run (a fan-out asks once), at the budget's lowest priority (`run_event`:
/// only while half the budget is left), never holding up the webhook.
pub fn learn_event(
    service: &std::sync::Arc<Service>,
    repository: Option<&str>,
    run_id: Option<u64>,
) {
    let (Some(repository), Some(run_id)) = (repository, run_id) else {
        return;
    };
    if service.github.is_none() || known_event(service, Some(repository), Some(run_id)).is_some() {
        return;
    }
    let key = (repository.to_lowercase(), run_id);
    let Ok(mut asking) = service.run_events.asking.lock() else {
        return;
    };
    if asking.len() >= CACHED_RUNS || !asking.insert(key.clone()) {
        return;
    }
    drop(asking);
    let service = service.clone();
    let repository = repository.to_owned();
    tokio::spawn(async move {
        if let Some(github) = &service.github {
            match github
                .get_run(&service.metrics, &repository, run_id, Priority::RunEvent)
                .await
            {
                Ok(run) => service.run_facts.put(key.clone(), (run.event, run.fork)),
                Err(error) => {
                    tracing::debug!(%error, repository, run_id, "cannot look the workflow run's event up; its jobs are labelled without it");
                }
            }
        }
        if let Ok(mut asking) = service.run_events.asking.lock() {
            asking.remove(&key);
        }
    });
}

/// Pool `name`'s access policy (the default admits all). Validated at
/// load: one that does not build admits nothing rather than everything.
/// Pool `name`'s policy as compiled at the configuration's load; a pool
/// without one admits all.
fn policy_of<'a>(policies: &'a AccessPolicies, name: &str) -> &'a Access {
    static ADMITS_ALL: std::sync::OnceLock<Access> = std::sync::OnceLock::new();
    policies
        .get(name)
        .unwrap_or_else(|| ADMITS_ALL.get_or_init(Access::default))
}

/// The runner's own check of the job GitHub actually gave it (its pre-job
/// report: `repository` and workflow run), against its pool's policy: a
/// just-in-time runner can be handed any queued job its labels match.
pub async fn judge_started_job(
    service: &Service,
    pool: &str,
    repository: &str,
    run_id: Option<u64>,
) -> Verdict {
    let (_, policies) = service.config_and_access();
    let access = policy_of(&policies, pool);
    if access.admits_all() {
        return Verdict::Allowed;
    }
    let facts = run_facts(service, Some(repository), run_id, access.needs_run_facts()).await;
    let verdict = access.judge(&facts);
    if let Verdict::Refused { rule, .. } = &verdict {
        service.metrics.access_refused(pool, rule.as_str());
    }
    verdict
}

/// Judges a job against the access policies of `candidates` (pool names,
/// best first), looking its run up only when one of them needs it.
pub async fn admit(service: &Service, payload: &WorkflowJob, candidates: &[String]) -> Admitted {
    let (_, compiled) = service.config_and_access();
    let policies: Vec<(&str, &Access)> = candidates
        .iter()
        .map(|name| (name.as_str(), policy_of(&compiled, name)))
        .collect();
    if policies.iter().all(|(_, access)| access.admits_all()) {
        return Admitted::Pool(candidates[0].clone(), Vec::new());
    }
    let needed = policies.iter().any(|(_, access)| access.needs_run_facts());
    let facts = run_facts(
        service,
        payload.repository.as_deref(),
        payload.run_id,
        needed,
    )
    .await;
    let (pool, refusals) = first_admitting(&policies, &facts);
    for refusal in &refusals {
        service
            .metrics
            .access_refused(&refusal.pool, refusal.rule.as_str());
    }
    let for_want_of_facts = refusals.iter().any(|refusal| {
        matches!(
            (refusal.rule, &facts.fork, &facts.event),
            (Rule::Fork, None, _) | (Rule::Event, _, None)
        )
    });
    match pool {
        Some(pool) => Admitted::Pool(pool.to_owned(), refusals),
        None if for_want_of_facts => Admitted::Unknown(refusals),
        None => Admitted::Refused(refusals),
    }
}

/// What a pool's runner group admits beyond the pool's access policy,
/// as warnings: GitHub hands the group's runners any job of a repository
/// the group admits, so a narrower policy holds only by runway's routing
/// and the runner's job-started hook.
pub fn runner_group_warnings(
    access: Option<&crate::config::PoolAccess>,
    org: &str,
    group: &crate::github::api::RunnerGroup,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let named = format!("runner group {:?} (id {})", group.name, group.id);
    let restricts_repositories = access.is_some_and(|a| !a.repositories.is_empty());
    if group.visibility == "all" && restricts_repositories {
        warnings.push(format!(
            "{named} admits every repository of {org}, more than the pool's access.repositories: runway's routing and the job-started hook hold the policy, GitHub does not; restrict the group to selected repositories"
        ));
    }
    if group.allows_public_repositories {
        let denies_forks = access.is_some_and(|a| a.forks == crate::config::ForksSetting::Deny);
        warnings.push(if denies_forks {
            format!(
                "{named} allows public repositories, wider than the pool's forks = \"deny\": runway refuses fork pull requests (routing and the job-started hook), GitHub would still hand them to these runners; disallow public repositories on the group"
            )
        } else {
            format!(
                "{named} allows public repositories: pull requests from forks of a public repository can run on this pool's runners; set [pools.access] forks = \"deny\" or disallow public repositories on the group"
            )
        });
    }
    warnings
}

/// Reads every GitHub organisation pool's runner group and keeps what it
/// admits beyond the pool's policy (`Service::runner_group_warnings`),
/// logging a warning when that changes. One request per pool; a pool
/// whose group cannot be read keeps its last warnings and fails the round.
pub async fn check_runner_groups(service: &Service) -> Result<(), String> {
    let Some(github) = service.github.clone() else {
        return Ok(());
    };
    let config = service.config();
    let mut failed = Vec::new();
    let mut seen = Vec::new();
    for pool in &config.pools {
        let Some(pool_github) = &pool.github else {
            continue;
        };
        let crate::config::Target::Org(org) = &pool_github.target else {
            continue;
        };
        if pool_github.scale_set.is_some() {
            continue;
        }
        seen.push(pool.name.clone());
        let group = match github
            .get_runner_group(&service.metrics, org, pool_github.runner_group_id)
            .await
        {
            Ok(group) => group,
            Err(error) => {
                failed.push(format!("pool {}: {error}", pool.name));
                continue;
            }
        };
        let warnings = runner_group_warnings(pool.access.as_ref(), org, &group);
        let Ok(mut known) = service.runner_group_warnings.lock() else {
            continue;
        };
        if known.get(&pool.name) != Some(&warnings) {
            for warning in &warnings {
                tracing::warn!(pool = %pool.name, "{warning}");
            }
            known.insert(pool.name.clone(), warnings);
        }
    }
    if let Ok(mut known) = service.runner_group_warnings.lock() {
        known.retain(|pool, _| seen.contains(pool));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("cannot read runner groups: {}", failed.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_group_wider_than_the_policy_is_said() {
        use crate::config::{ForksSetting, PoolAccess};
        use crate::github::api::RunnerGroup;
        let group = |visibility: &str, public: bool| RunnerGroup {
            id: 7,
            name: "ci".into(),
            visibility: visibility.into(),
            allows_public_repositories: public,
        };
        let narrow = PoolAccess {
            repositories: vec!["o/app".into()],
            forks: ForksSetting::Deny,
            events: None,
        };
        let said = |access: Option<&PoolAccess>, group: &RunnerGroup| {
            runner_group_warnings(access, "o", group)
                .iter()
                .map(|w| w.split(':').next().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        };
        assert!(said(Some(&narrow), &group("selected", false)).is_empty());
        assert!(
            said(None, &group("all", false)).is_empty(),
            "no policy to widen"
        );
        assert_eq!(
            said(Some(&narrow), &group("all", true)),
            [
                "runner group \"ci\" (id 7) admits every repository of o, more than the pool's access.repositories",
                "runner group \"ci\" (id 7) allows public repositories, wider than the pool's forks = \"deny\"",
            ]
        );
        assert_eq!(
            said(None, &group("selected", true)),
            ["runner group \"ci\" (id 7) allows public repositories"]
        );
    }

    #[test]
    fn the_cache_keeps_the_newest_runs_only() {
        let cache = RunFactsCache::default();
        for run in 0..(CACHED_RUNS as u64 + 10) {
            cache.put(("o/r".into(), run), ("push".into(), false));
        }
        // The same run again takes no second place.
        cache.put(
            ("o/r".into(), CACHED_RUNS as u64 + 9),
            ("push".into(), false),
        );
        assert_eq!(cache.get(&("o/r".into(), 9)), None, "dropped, oldest first");
        assert!(cache.get(&("o/r".into(), 10)).is_some());
        let inner = cache.inner.lock().unwrap();
        assert_eq!((inner.0.len(), inner.1.len()), (CACHED_RUNS, CACHED_RUNS));
    }
}
