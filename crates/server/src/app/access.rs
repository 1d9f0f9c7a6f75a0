//! Pools' access policies at intake: the facts of a job's workflow run
//! (looked up once per run at GitHub, kept in a bounded cache), and the
//! first pool serving the job's labels whose policy admits it. The
//! decision itself is `runway_core::access`'s.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use runway_core::access::{first_admitting, Access, Forks, Refusal, Rule, RunFacts, Verdict};

use crate::app::Service;
use crate::github::payload::WorkflowJob;

/// How many runs' facts are kept: a run's jobs arrive within minutes, so
/// this is many hours of runs, in a few hundred kilobytes.
const CACHED_RUNS: usize = 4_096;

/// Facts of workflow runs, by `(repository, run id)`, oldest dropped first.
/// Only successful lookups are kept: a failed one is asked again by the
/// next job of the run (within the request budget).
/// A run: `(repository, run id)`; its facts: `(event, fork)`.
type RunKey = (String, u64);
type Facts = (String, bool);

#[derive(Default)]
pub struct RunFactsCache {
    inner: Mutex<(BTreeMap<RunKey, Facts>, VecDeque<RunKey>)>,
}

impl RunFactsCache {
    fn get(&self, key: &RunKey) -> Option<Facts> {
        self.inner.lock().ok()?.0.get(key).cloned()
    }

    fn put(&self, key: RunKey, facts: Facts) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let (map, order) = &mut *inner;
        if map.insert(key.clone(), facts).is_none() {
            order.push_back(key);
        }
        while order.len() > CACHED_RUNS {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }
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
            Some(github) => match github.get_run(&service.metrics, repository, run_id).await {
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

/// Pool `name`'s access policy (the default admits all). Validated at
/// load: one that does not build admits nothing rather than everything.
fn policy_of(config: &crate::config::Config, name: &str) -> Access {
    match config.pool(name).and_then(|pool| pool.access.as_ref()) {
        None => Access::default(),
        Some(access) => access.build().unwrap_or_else(|_| {
            Access::new(&["!*/*".to_owned()], Forks::Deny, None).unwrap_or_default()
        }),
    }
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
    let access = policy_of(&service.config(), pool);
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
    let config = service.config();
    let policies: Vec<(&str, Access)> = candidates
        .iter()
        .map(|name| (name.as_str(), policy_of(&config, name)))
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
    let judged: Vec<(&str, &Access)> = policies.iter().map(|(n, a)| (*n, a)).collect();
    let (pool, refusals) = first_admitting(&judged, &facts);
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

#[cfg(test)]
mod tests {
    use super::*;

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
