//! The lease sweeper and the leadership keeper: background workers of the
//! one shape in `crate::tasks`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::app::lease::Lease;
use crate::app::Service;
use crate::clock::now;
use crate::tasks::Worker;

/// Returns the lease sweeper's period for a lease length: often enough that
/// a dead runner's job waits at most a few percent past its deadline.
pub fn sweep_period(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(200), Duration::from_secs(5))
}

/// Runs the lease sweeper until `shutdown` becomes true.
pub async fn lease_sweeper(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let worker = Worker {
        name: "sweep_leases",
        period: sweep_period(service.config().runner_api.lease),
        leader_only: false,
        first_round_at_once: false,
        wake: None,
    };
    // Heartbeats sent while this process was down never arrived: it
    // expires no lease before it has been up for one whole lease.
    let up_since = now();
    let lease = service.config().runner_api.lease;
    worker
        .run(&service.tasks, &|| true, shutdown, || {
            let service = service.clone();
            async move {
                let now = now();
                if !runway_core::moves::may_expire_leases(up_since, lease, now) {
                    return Ok(());
                }
                crate::app::jobs::sweep_leases(&service, now)
                    .await
                    .map(|_| ())
                    .inspect_err(|_| service.store_failed("sweep_leases"))
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
    shutdown: watch::Receiver<bool>,
    others_stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let lead: Arc<tokio::sync::Mutex<Option<Box<dyn runway_store::Leadership>>>> =
        Arc::new(tokio::sync::Mutex::new(None));
    let worker = Worker {
        name: "leadership",
        period,
        leader_only: false,
        first_round_at_once: true,
        wake: None,
    };
    worker
        .run(&service.tasks, &|| true, shutdown, || {
            let (service, lead) = (service.clone(), lead.clone());
            async move {
                let mut lead = lead.lock().await;
                let outcome = keep_the_lead(&service, &mut lead, period * SILENT_ROUNDS).await;
                // A lead taken over leads (runs the reconciler and the
                // healer) once the previous holder's lease has run out.
                let acting = service
                    .lease()
                    .acting_at()
                    .is_some_and(|from| from <= std::time::Instant::now());
                let leading = lead.is_some() && acting;
                let was = service
                    .leading
                    .swap(leading, std::sync::atomic::Ordering::SeqCst);
                service.metrics.leader.set(i64::from(leading));
                if leading && !was {
                    tracing::info!(
                        term = service.term.load(std::sync::atomic::Ordering::SeqCst),
                        "acting: this replica runs the reconciler and the GitHub healer"
                    );
                }
                if leading {
                    // A new leader's first round need not wait for the timer.
                    service.reconcile_wanted.notify_one();
                }
                outcome
            }
        })
        .await;
    // Stopping: no side effect from here on. Once the other workers have
    // stopped (`others_stopped`), the term is released, so that the next
    // leader need not wait out this one's lease, and the lock given up.
    service.set_lease(Lease::NotHeld);
    service
        .leading
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let mut lead = lead.lock().await;
    if lead.is_some() {
        let _ = others_stopped.await;
        let term = service.term.load(std::sync::atomic::Ordering::SeqCst);
        match service.store.end_term(LEAD, term).await {
            Ok(()) => tracing::info!(term, "released the lead"),
            Err(error) => {
                tracing::warn!(%error, term, "could not release the lead; the next leader waits out this one's lease")
            }
        }
    }
    lead.take();
}

/// The name replicas contend for the lead under.
pub const LEAD: &str = "runway";

/// A leader that misses this many of its checks in a row (paused, cut
/// off) loses the lead: its database session is ended, freeing the lock.
pub const SILENT_ROUNDS: u32 = 5;

/// How often a replica records that it is alive, and how long the cluster
/// view remembers a silent one.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
pub const FORGET_REPLICA_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Records this replica in the store every [`HEARTBEAT`] (the cluster
/// view), forgetting replicas silent for a day.
pub async fn replica_heartbeat(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let worker = Worker {
        name: "replica_heartbeat",
        period: HEARTBEAT,
        leader_only: false,
        first_round_at_once: true,
        wake: None,
    };
    worker
        .run(&service.tasks, &|| true, shutdown, || {
            let service = service.clone();
            async move {
                let now = now();
                let replica = runway_store::Replica {
                    id: service.replica.clone(),
                    address: service.address.get().cloned().unwrap_or_default(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    started_at: service.started_at,
                    heartbeat_at: now,
                };
                service
                    .store
                    .heartbeat_replica(&replica, now.minus(FORGET_REPLICA_AFTER))
                    .await
                    .inspect_err(|_| service.store_failed("heartbeat_replica"))
            }
        })
        .await
}

/// One leadership round: keep the lead if it is still held, else try for it.
async fn keep_the_lead(
    service: &Service,
    lead: &mut Option<Box<dyn runway_store::Leadership>>,
    silence: Duration,
) -> Result<(), runway_store::StoreError> {
    // The lease runs from before the check: the server keeps the lock for
    // `silence` after the check's statement ended, which is later.
    let checked = std::time::Instant::now();
    let held = match lead.as_mut() {
        Some(held) => held.still_held().await,
        None => false,
    };
    if held {
        let term = service.term.load(std::sync::atomic::Ordering::SeqCst);
        let lease = Lease::renewed(term, checked, silence);
        let lease = match service.lease().acting_at() {
            Some(from) => lease.acting_from(from),
            None => lease,
        };
        service.set_lease(lease);
        return Ok(());
    }
    if lead.take().is_some() {
        // No side effect from here on, whatever a round in flight does.
        service.set_lease(Lease::NotHeld);
        service.term.store(0, std::sync::atomic::Ordering::SeqCst);
        tracing::warn!("lost the lead (its database session ended); trying again");
    }
    match service.store.try_lead(LEAD, silence).await {
        Ok(Some(new)) => {
            // A new term while the lock is held: the lock is given up
            // (dropped) if the term or its predecessor cannot be read.
            // The previous holder is read first: while this replica holds
            // the lock no other term begins, and a release that lands in
            // between only makes this one wait when it need not.
            let previous = service
                .store
                .leader(LEAD)
                .await
                .inspect_err(|_| service.store_failed("leader"))?;
            let term = service
                .store
                .begin_term(LEAD, &service.replica, now())
                .await
                .inspect_err(|_| service.store_failed("begin_term"))?;
            let waits = !new.exclusive() && previous.is_some_and(|p| !p.replica.is_empty());
            service.lead_in(term);
            service.lead_waited_ms.store(
                if waits { silence.as_millis() as u64 } else { 0 },
                std::sync::atomic::Ordering::SeqCst,
            );
            service.set_lease(Lease::taken(term, checked, silence, waits));
            *lead = Some(new);
            tracing::info!(
                term,
                wait_ms = if waits { silence.as_millis() as u64 } else { 0 },
                "leading: this replica took the lead{}",
                if waits {
                    "; it acts once the previous leader's lease has run out"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(error) => {
            service.store_failed("try_lead");
            Err(error)
        }
    }
}
