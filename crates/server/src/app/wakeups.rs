//! Wake-ups across replicas that share a PostgreSQL store: a job enqueued
//! or requeued on one replica wakes the runners long-polling on the others
//! at once, and a reconcile request reaches the leader wherever it runs.
//!
//! `Service::wake_runners` and `Service::want_reconcile` wake this process
//! and mark the wake-up in [`Outgoing`]; a job wakes only the runners of its
//! own pool ([`JobWakes`]), here and on the other replicas; the announcer sends what is marked
//! (one statement for whatever piled up while the previous one was in
//! flight, so its cost does not grow with the request rate), and the
//! listener turns what other replicas announce into local wake-ups. Its
//! own announcements come back to it and are ignored. A lost listening
//! connection is reconnected with back-off and counts as a wake-up of
//! everything (something may have been missed); the long poll's timer
//! re-poll stays the fallback. On SQLite (one process) both workers end at
//! once: there is nobody else to wake.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use runway_store::{Heard, StoreError, Wake};
use tokio::sync::watch;

use crate::app::Service;
use crate::tasks::Worker;
use crate::telemetry::metrics::WakeLabels;

/// The runners long-polling on this replica, by pool: a job arriving in
/// one pool wakes that pool's waiters, not every idle runner of every pool
/// (each woken runner pays a claim, so waking all would cost a claim per
/// idle runner of the whole fleet per job).
#[derive(Default)]
pub struct JobWakes {
    pools: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl JobWakes {
    /// What a runner of `pool` waits on.
    pub fn of(&self, pool: &str) -> Arc<tokio::sync::Notify> {
        lock(&self.pools)
            .entry(pool.to_owned())
            .or_default()
            .clone()
    }

    /// Wakes the waiters of `pool`, or of every pool.
    pub fn wake(&self, pool: Option<&str>) {
        let mut pools = lock(&self.pools);
        match pool {
            Some(pool) => {
                if let Some(waiters) = pools.get(pool) {
                    waiters.notify_waiters();
                }
            }
            None => {
                // Pools nobody waits on any more (held only here) go.
                pools.retain(|_, waiters| Arc::strong_count(waiters) > 1);
                for waiters in pools.values() {
                    waiters.notify_waiters();
                }
            }
        }
    }

    /// How many pools have had waiters (for tests).
    #[cfg(test)]
    fn pools(&self) -> usize {
        lock(&self.pools).len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

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
                    Wake::JobAvailable { pool } => service.job_wakes.wake(pool.as_deref()),
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
    service.job_wakes.wake(None);
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

    /// Polls a waiter once: whether it was woken.
    fn woken(waiter: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>) -> bool {
        use std::future::Future;
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        waiter.as_mut().poll(&mut context).is_ready()
    }

    #[test]
    fn a_job_wakes_the_runners_of_its_pool_only() {
        let wakes = JobWakes::default();
        let (linux, gpu) = (wakes.of("linux"), wakes.of("gpu"));
        let mut linux_waiter = Box::pin(linux.notified());
        let mut gpu_waiter = Box::pin(gpu.notified());
        linux_waiter.as_mut().enable();
        gpu_waiter.as_mut().enable();
        wakes.wake(Some("linux"));
        wakes.wake(Some("arm"));
        assert!(woken(&mut linux_waiter));
        assert!(!woken(&mut gpu_waiter), "another pool's job");
        wakes.wake(None);
        assert!(woken(&mut gpu_waiter), "every pool");
    }

    #[test]
    fn pools_nobody_waits_on_are_forgotten() {
        let wakes = JobWakes::default();
        let held = wakes.of("linux");
        drop(wakes.of("gone"));
        wakes.wake(None);
        assert_eq!(wakes.pools(), 1);
        drop(held);
        wakes.wake(None);
        assert_eq!(wakes.pools(), 0);
    }
}
