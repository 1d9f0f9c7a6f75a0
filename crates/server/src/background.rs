//! Background tasks, one shape for all (STYLE rule 7): a loop on a timer
//! that stops when the shutdown signal flips, counts consecutive errors and
//! backs off (jittered, capped) while they last.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use runway_store::StoreError;
use tokio::sync::watch;

use crate::service::{now, Service};

/// Returns the lease sweeper's period for a lease length: often enough that
/// a dead runner's job waits at most a few percent past its deadline.
pub fn sweep_period(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(200), Duration::from_secs(5))
}

/// Runs `task` every `period` until `shutdown` becomes true; while it
/// fails, waits longer (doubling, jittered, at most a minute).
pub async fn every<F, Fut>(
    name: &'static str,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut task: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut consecutive_errors: u32 = 0;
    loop {
        let wait = if consecutive_errors == 0 {
            period
        } else {
            let backoff = period.saturating_mul(2u32.saturating_pow(consecutive_errors.min(6)));
            let capped = backoff.min(Duration::from_secs(60).max(period));
            capped.mul_f64(rand::thread_rng().gen_range(0.5..1.0))
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if *shutdown.borrow() {
            return;
        }
        match task().await {
            Ok(()) => consecutive_errors = 0,
            Err(error) => {
                consecutive_errors += 1;
                tracing::warn!(task = name, %error, consecutive_errors, "background task failed; backing off");
            }
        }
    }
}

/// Runs the lease sweeper until `shutdown` becomes true.
pub async fn lease_sweeper(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let period = sweep_period(service.config.runner_api.lease);
    every("sweep_leases", period, shutdown, || {
        let service = service.clone();
        async move {
            crate::runner_api::sweep_leases(&service, now())
                .await
                .map(|_| ())
                .inspect_err(|_| service.metrics.store_error("sweep_leases"))
        }
    })
    .await
}

/// Keeps `service.leading` true exactly while this replica holds the lead
/// (`Store::try_lead`): tries every `period` while it does not, checks the
/// lead is still held every `period` while it does. Leading comes first:
/// the first try is at once.
pub async fn leadership(
    service: Arc<Service>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering;
    let mut lead: Option<Box<dyn runway_store::Leadership>> = None;
    loop {
        let held = match lead.as_mut() {
            Some(held) => held.still_held().await,
            None => false,
        };
        if !held {
            if lead.take().is_some() {
                tracing::warn!("lost the lead (its database session ended); trying again");
            }
            match service.store.try_lead("runway").await {
                Ok(Some(new)) => {
                    lead = Some(new);
                    tracing::info!(
                        "leading: this replica runs the reconciler and the GitHub healer"
                    );
                }
                Ok(None) => {}
                Err(error) => {
                    service.metrics.store_error("try_lead");
                    tracing::warn!(%error, "cannot try for the lead");
                }
            }
        }
        let leading = lead.is_some();
        service.leading.store(leading, Ordering::SeqCst);
        service.metrics.leader.set(i64::from(leading));
        if leading {
            // A new leader's first round need not wait for the timer.
            service.reconcile_wanted.notify_one();
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(period) => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
