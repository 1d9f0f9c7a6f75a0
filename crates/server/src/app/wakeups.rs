//! Wake-ups across replicas that share a PostgreSQL store: a job enqueued
//! or requeued on one replica wakes the runners long-polling on the others
//! at once, and a reconcile request reaches the leader wherever it runs.
//!
//! `Service::wake_runners` and `Service::want_reconcile` wake this process
//! and mark the wake-up in [`Outgoing`]; the announcer sends what is marked
//! (one statement for whatever piled up while the previous one was in
//! flight, so its cost does not grow with the request rate), and the
//! listener turns what other replicas announce into local wake-ups. Its
//! own announcements come back to it and are ignored. A lost listening
//! connection is reconnected with back-off and counts as a wake-up of
//! everything (something may have been missed); the long poll's timer
//! re-poll stays the fallback. On SQLite (one process) both workers end at
//! once: there is nobody else to wake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runway_store::{Heard, StoreError, Wake};
use tokio::sync::watch;

use crate::app::Service;
use crate::tasks::Worker;
use crate::telemetry::metrics::WakeLabels;

/// Wake-ups not yet announced to the other replicas.
#[derive(Default)]
pub struct Outgoing {
    job: AtomicBool,
    reconcile: AtomicBool,
    /// Wakes the announcer (a permit is kept if it is busy).
    pub ready: tokio::sync::Notify,
}

impl Outgoing {
    pub fn add(&self, wake: Wake) {
        let flag = match wake {
            Wake::JobAvailable => &self.job,
            Wake::ReconcileWanted => &self.reconcile,
        };
        if !flag.swap(true, Ordering::SeqCst) {
            self.ready.notify_one();
        }
    }

    /// What is pending, cleared.
    fn take(&self) -> Vec<Wake> {
        let mut wakes = Vec::new();
        if self.job.swap(false, Ordering::SeqCst) {
            wakes.push(Wake::JobAvailable);
        }
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
                            count(&service, "sent", *wake);
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
                count(service, "received", wake);
                match wake {
                    Wake::JobAvailable => service.job_available.notify_waiters(),
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
    service.job_available.notify_waiters();
    service.reconcile_wanted.notify_one();
}

fn shares_its_store(service: &Service) -> bool {
    service.store.backend() == runway_store::Backend::Postgres
}

fn count(service: &Service, direction: &'static str, wake: Wake) {
    service
        .metrics
        .wakeups
        .get_or_create(&WakeLabels {
            direction,
            kind: wake.as_str(),
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
            outgoing.add(Wake::JobAvailable);
        }
        outgoing.add(Wake::ReconcileWanted);
        assert_eq!(outgoing.take(), [Wake::JobAvailable, Wake::ReconcileWanted]);
        assert!(outgoing.take().is_empty(), "taken once");
    }
}
