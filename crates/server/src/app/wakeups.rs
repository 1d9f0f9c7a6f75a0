//! Wake-ups across replicas that share a PostgreSQL store: a job enqueued
//! or requeued on one replica wakes the runners long-polling on the others
//! at once, and a reconcile request reaches the leader wherever it runs.
//!
//! `Service::wake_runners` and `Service::want_reconcile` wake this process
//! and mark the wake-up in [`Outgoing`] (a job's names its pool: it wakes
//! only that pool's runners; see `app::waiters` for which are woken here);
//! the announcer sends what is marked
//! (one statement for whatever piled up while the previous one was in
//! flight, so its cost does not grow with the request rate), and the
//! listener turns what other replicas announce into local wake-ups. Its
//! own announcements come back to it and are ignored. A lost listening
//! connection is reconnected with back-off and counts as a wake-up of
//! everything (something may have been missed); the long poll's timer
//! re-poll stays the fallback. On SQLite (one process) both workers end at
//! once: there is nobody else to wake.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runway_store::{Heard, StoreError, Wake};
use tokio::sync::watch;

use crate::app::waiters::lock;
use crate::app::Service;
use crate::tasks::Worker;
use crate::telemetry::metrics::WakeLabels;

/// More pools than this pending at once are announced as one wake-up of
/// every pool.
const MAX_PENDING_POOLS: usize = 64;

/// Wake-ups not yet announced to the other replicas.
#[derive(Default)]
pub struct Outgoing {
    /// Pools with a job that may wait; `None` stands for every pool.
    jobs: Mutex<BTreeSet<Option<String>>>,
    reconcile: AtomicBool,
    /// Wakes the announcer (a permit is kept if it is busy).
    pub ready: tokio::sync::Notify,
}

impl Outgoing {
    pub fn add(&self, wake: Wake) {
        let first = match wake {
            Wake::JobAvailable { pool } => {
                let mut jobs = lock(&self.jobs);
                let first = jobs.is_empty();
                if !jobs.contains(&None) {
                    if pool.is_none() || jobs.len() >= MAX_PENDING_POOLS {
                        jobs.clear();
                        jobs.insert(None);
                    } else {
                        jobs.insert(pool);
                    }
                }
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
        let mut wakes: Vec<Wake> = std::mem::take(&mut *lock(&self.jobs))
            .into_iter()
            .map(|pool| Wake::JobAvailable { pool })
            .collect();
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
                    Err(_) => service.metrics.store_error("announce"),
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
