//! Background tasks, one shape for all (STYLE rule 7): a loop on a timer
//! that stops when the shutdown signal flips, counts consecutive errors and
//! backs off (jittered, capped) while they last.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;

use crate::service::{now, Service};

/// Returns the lease sweeper's period for a lease length: often enough that
/// a dead runner's job waits at most a few percent past its deadline.
pub fn sweep_period(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(200), Duration::from_secs(5))
}

/// Runs the lease sweeper until `shutdown` becomes true.
pub async fn lease_sweeper(service: Arc<Service>, mut shutdown: watch::Receiver<bool>) {
    let period = sweep_period(service.config.runner_api.lease);
    let mut consecutive_errors: u32 = 0;
    loop {
        let wait = if consecutive_errors == 0 {
            period
        } else {
            let backoff = period.saturating_mul(2u32.saturating_pow(consecutive_errors.min(6)));
            let capped = backoff.min(Duration::from_secs(60));
            capped.mul_f64(rand::thread_rng().gen_range(0.5..1.0))
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if *shutdown.borrow() {
            return;
        }
        match crate::runner_api::sweep_leases(&service, now()).await {
            Ok(_) => consecutive_errors = 0,
            Err(error) => {
                consecutive_errors += 1;
                service.metrics.store_error("sweep_leases");
                tracing::warn!(%error, consecutive_errors, "lease sweep failed; backing off");
            }
        }
    }
}
