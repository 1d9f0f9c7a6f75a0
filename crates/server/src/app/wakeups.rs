//! Wake-ups across replicas that share a PostgreSQL store: a job enqueued
//! or requeued on one replica wakes the runners long-polling on the others
//! at once, and a reconcile request reaches the leader wherever it runs.
//!
//! `Service::wake_runners`, `Service::job_queued` and
//! `Service::want_reconcile` wake this process and mark the wake-up in
//! [`Outgoing`]. A queued job's wake-up names its pool and what it wants (labels,
//! runners it declined), and jobs alike are counted: each replica wakes as
//! many of its runners that can take one as there are jobs, as it does
//! for its own (`app::waiters`), not every runner of the pool. A wake-up
//! whose jobs are not known (a reload) names the pool, or every pool;
//! the announcer sends what is marked
//! (one statement for whatever piled up while the previous one was in
//! flight, so its cost does not grow with the request rate), and the
//! listener turns what other replicas announce into local wake-ups. Its
//! own announcements come back to it and are ignored. A lost listening
//! connection is reconnected with back-off and counts as a wake-up of
//! everything (something may have been missed); the waiters' safety net
//! (`app::waiters::safety_net`) stays the fallback. On SQLite (one process) both workers end at
//! once: there is nobody else to wake.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runway_store::{Heard, StoreError, Wake, Wanted};
use tokio::sync::watch;

use crate::app::waiters::lock;
use crate::app::Service;
use crate::tasks::Worker;
use crate::telemetry::metrics::WakeLabels;

/// More pools than this pending at once are announced as one wake-up of
/// every pool; more kinds of queued job (pool, labels, declined runners)
/// than this, as a wake-up of each further job's whole pool.
const MAX_PENDING_POOLS: usize = 64;

/// Wake-ups not yet announced to the other replicas.
#[derive(Default)]
pub struct Outgoing {
    jobs: Mutex<PendingJobs>,
    reconcile: AtomicBool,
    /// Wakes the announcer (a permit is kept if it is busy).
    pub ready: tokio::sync::Notify,
}

/// Job wake-ups not yet announced.
#[derive(Default)]
struct PendingJobs {
    /// Pools every runner of which should look; `None` stands for every
    /// pool.
    pools: BTreeSet<Option<String>>,
    /// Jobs queued, by pool and what they want: how many.
    queued: BTreeMap<(String, Wanted), u32>,
}

impl PendingJobs {
    fn is_empty(&self) -> bool {
        self.pools.is_empty() && self.queued.is_empty()
    }

    /// Whether every runner of `pool` will look anyway.
    fn covers(&self, pool: &str) -> bool {
        self.pools.contains(&None) || self.pools.contains(&Some(pool.to_owned()))
    }

    fn wake_pool(&mut self, pool: Option<String>) {
        if self.pools.contains(&None) || self.pools.contains(&pool) {
            return;
        }
        if pool.is_none() || self.pools.len() >= MAX_PENDING_POOLS {
            self.pools.clear();
            self.queued.clear();
            self.pools.insert(None);
        } else {
            self.pools.insert(pool);
        }
    }

    fn queued(&mut self, pool: String, wanted: Wanted, count: u32) {
        if self.covers(&pool) {
            return;
        }
        let key = (pool, wanted);
        if let Some(pending) = self.queued.get_mut(&key) {
            *pending = pending.saturating_add(count);
        } else if self.queued.len() >= MAX_PENDING_POOLS {
            // Too many kinds of job at once: every runner of the pool looks.
            self.wake_pool(Some(key.0));
        } else {
            self.queued.insert(key, count);
        }
    }
}

impl Outgoing {
    pub fn add(&self, wake: Wake) {
        let first = match wake {
            Wake::JobAvailable { pool } => {
                let mut jobs = lock(&self.jobs);
                let first = jobs.is_empty();
                jobs.wake_pool(pool);
                first
            }
            Wake::JobsQueued {
                pool,
                wanted,
                count,
            } => {
                let mut jobs = lock(&self.jobs);
                let first = jobs.is_empty();
                jobs.queued(pool, wanted, count);
                first
            }
            Wake::ReconcileWanted => !self.reconcile.swap(true, Ordering::SeqCst),
        };
        if first {
            self.ready.notify_one();
        }
    }

    /// What is pending, cleared.
    fn take(&self) -> Vec<Wake> {
        let jobs = std::mem::take(&mut *lock(&self.jobs));
        let mut wakes: Vec<Wake> = jobs
            .queued
            .iter()
            .filter(|((pool, _), _)| !jobs.covers(pool))
            .map(|((pool, wanted), count)| Wake::JobsQueued {
                pool: pool.clone(),
                wanted: wanted.clone(),
                count: *count,
            })
            .collect();
        wakes.extend(
            jobs.pools
                .into_iter()
                .map(|pool| Wake::JobAvailable { pool }),
        );
        if self.reconcile.swap(false, Ordering::SeqCst) {
            wakes.push(Wake::ReconcileWanted);
        }
        wakes
    }
}

/// Sends the pending wake-ups whenever there are some.
pub async fn announcer(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    if !shares_its_store(&service) {
        return;
    }
    let worker = Worker {
        name: "announce_wakeups",
        period: Duration::from_secs(5),
        leader_only: false,
        first_round_at_once: false,
        wake: Some(&service.outgoing.ready),
    };
    worker
        .run(&service.tasks, &|| true, shutdown, || {
            let service = service.clone();
            async move {
                let wakes = service.outgoing.take();
                if wakes.is_empty() {
                    return Ok(());
                }
                let sent = service.store.announce(&service.replica, &wakes).await;
                match &sent {
                    Ok(()) => {
                        for wake in &wakes {
                            count(&service, "sent", wake);
                        }
                    }
                    Err(_) => service.store_failed("announce"),
                }
                sent
            }
        })
        .await
}

/// Listens for the other replicas' wake-ups and wakes this one.
pub async fn listener(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    if !shares_its_store(&service) {
        return;
    }
    let worker = Worker {
        name: "listen_wakeups",
        period: Duration::from_secs(1),
        leader_only: false,
        first_round_at_once: true,
        wake: None,
    };
    let stop = shutdown.clone();
    worker
        .run(&service.tasks, &|| true, shutdown, || {
            let (service, mut stop) = (service.clone(), stop.clone());
            async move {
                let listening = listen(&service);
                tokio::select! {
                    outcome = listening => outcome,
                    _ = stop.wait_for(|stop| *stop) => Ok(()),
                }
            }
        })
        .await
}

/// One listening session: until its connection fails for good (then the
/// worker backs off and opens another).
async fn listen(service: &Service) -> Result<(), StoreError> {
    let Some(mut listener) = service.store.listen().await? else {
        return Ok(());
    };
    // Anything announced before this session began was not heard.
    wake_everything(service);
    loop {
        match listener.next().await? {
            Heard::Wake { from, .. } if from == service.replica => {}
            Heard::Wake { wake, .. } => {
                count(service, "received", &wake);
                match wake {
                    Wake::JobAvailable { pool } => service.waiters.wake_all(pool.as_deref()),
                    Wake::JobsQueued {
                        pool,
                        wanted,
                        count,
                    } => service.waiters.jobs_queued(&pool, &wanted, count),
                    Wake::ReconcileWanted => service.reconcile_wanted.notify_one(),
                }
            }
            Heard::Lost => {
                tracing::warn!("the wake-up listener lost its connection; reconnecting");
                wake_everything(service);
            }
        }
    }
}

fn wake_everything(service: &Service) {
    service.waiters.wake_all(None);
    service.reconcile_wanted.notify_one();
}

fn shares_its_store(service: &Service) -> bool {
    service.store.backend() == runway_store::Backend::Postgres
}

fn count(service: &Service, direction: &'static str, wake: &Wake) {
    service
        .metrics
        .wakeups
        .get_or_create(&WakeLabels {
            direction,
            kind: wake.kind(),
        })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_wakeups_pile_up_into_one_announcement() {
        let outgoing = Outgoing::default();
        assert!(outgoing.take().is_empty());
        for _ in 0..3 {
            outgoing.add(Wake::job_in("linux"));
        }
        outgoing.add(Wake::job_in("gpu"));
        outgoing.add(Wake::ReconcileWanted);
        assert_eq!(
            outgoing.take(),
            [
                Wake::job_in("gpu"),
                Wake::job_in("linux"),
                Wake::ReconcileWanted
            ]
        );
        assert!(outgoing.take().is_empty(), "taken once");
    }

    fn queued(pool: &str, labels: &[&str], count: u32) -> Wake {
        Wake::JobsQueued {
            pool: pool.to_owned(),
            wanted: Wanted {
                labels: labels.iter().map(|l| (*l).to_owned()).collect(),
                excluded: vec![],
            },
            count,
        }
    }

    #[test]
    fn queued_jobs_alike_are_counted_in_one_announcement() {
        let outgoing = Outgoing::default();
        for _ in 0..3 {
            outgoing.add(queued("linux", &["x64"], 1));
        }
        outgoing.add(queued("linux", &["arm64"], 1));
        outgoing.add(queued("gpu", &[], 2));
        assert_eq!(
            outgoing.take(),
            [
                queued("gpu", &[], 2),
                queued("linux", &["arm64"], 1),
                queued("linux", &["x64"], 3),
            ]
        );
        assert!(outgoing.take().is_empty(), "taken once");
    }

    #[test]
    fn a_wakeup_of_a_whole_pool_covers_its_queued_jobs() {
        let outgoing = Outgoing::default();
        outgoing.add(queued("linux", &[], 1));
        outgoing.add(Wake::job_in("linux"));
        outgoing.add(queued("linux", &["x64"], 1));
        outgoing.add(queued("gpu", &[], 1));
        assert_eq!(
            outgoing.take(),
            [queued("gpu", &[], 1), Wake::job_in("linux")]
        );
        // Too many kinds of job in a pool at once: its runners all look.
        for kind in 0..=MAX_PENDING_POOLS {
            outgoing.add(queued("linux", &[&format!("label-{kind}")], 1));
        }
        assert_eq!(outgoing.take(), [Wake::job_in("linux")]);
        outgoing.add(queued("linux", &[], 1));
        outgoing.add(Wake::job_anywhere());
        assert_eq!(outgoing.take(), [Wake::job_anywhere()]);
    }

    #[test]
    fn a_wakeup_of_every_pool_or_too_many_pools_is_one_announcement() {
        let outgoing = Outgoing::default();
        outgoing.add(Wake::job_in("linux"));
        outgoing.add(Wake::job_anywhere());
        outgoing.add(Wake::job_in("gpu"));
        assert_eq!(outgoing.take(), [Wake::job_anywhere()]);
        for pool in 0..=MAX_PENDING_POOLS {
            outgoing.add(Wake::job_in(&format!("pool-{pool}")));
        }
        assert_eq!(outgoing.take(), [Wake::job_anywhere()]);
    }
}
