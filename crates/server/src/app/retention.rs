//! Retention (`[retention]`): the leader deletes finished history older
//! than its setting, in bounded batches, each its own short transaction, so
//! intake never waits long behind it; live work is never touched (the
//! store's predicates select finished rows only). Each pass then gives the
//! freed pages back (SQLite) and counts the rows left
//! (`runway_store_rows{table}`); what it deleted is
//! `runway_retention_pruned_total{table}`.

use std::sync::Arc;
use std::time::Duration;

use runway_core::Timestamp;
use runway_store::{Prunable, StoreError};
use tokio::sync::watch;

use crate::app::Service;
use crate::clock::now;
use crate::config::RetentionConfig;
use crate::tasks::Worker;
use crate::telemetry::metrics::TableLabel;

/// The most batches of one kind in one pass: a pass is bounded even when a
/// long history is pruned for the first time (the next pass goes on).
pub const MAX_BATCHES: u32 = 100;

/// Once-keys (work done once) live as long as deliveries; expired GARM
/// instance tokens a day.
const EXPIRED_TOKENS: Duration = Duration::from_secs(24 * 3600);

/// How long `what` is kept under `retention`; `None` keeps it forever.
pub fn kept(retention: &RetentionConfig, what: Prunable) -> Option<Duration> {
    let kept = match what {
        Prunable::FinishedJobs => retention.finished_jobs,
        Prunable::EndedRunners => retention.ended_runners,
        Prunable::Deliveries | Prunable::OnceKeys => retention.deliveries,
        Prunable::JobLogs => retention.job_logs,
        Prunable::RunnerReports => retention.runner_reports,
        Prunable::InstanceTokens => EXPIRED_TOKENS,
        Prunable::Audit => retention.audit,
        Prunable::PoolHistory => retention.pool_history,
    };
    (!kept.is_zero()).then_some(kept)
}

/// What one pass deleted, per kind.
pub type Pruned = Vec<(Prunable, u64)>;

/// One pass at `now`: prunes every kind, reclaims space, counts rows.
pub async fn prune(service: &Service, now: Timestamp) -> Result<Pruned, StoreError> {
    let retention = &service.config().retention;
    let store = &service.store;
    let mut pruned = Vec::new();
    for what in Prunable::ALL {
        let Some(kept) = kept(retention, what) else {
            continue;
        };
        let before = now.minus(kept);
        let mut total = 0;
        for _ in 0..MAX_BATCHES {
            // The leader's work: a replica that cannot show it still
            // leads (paused, deposed) deletes nothing more.
            if service.may_act("retention").await.is_err() {
                return Ok(pruned);
            }
            let deleted = store.prune(what, before, retention.batch).await?;
            total += deleted;
            if deleted < u64::from(retention.batch) {
                break;
            }
            // Let intake's writes in between batches.
            tokio::task::yield_now().await;
        }
        if total > 0 {
            service
                .metrics
                .retention_pruned
                .get_or_create(&TableLabel {
                    table: what.table(),
                })
                .inc_by(total);
            tracing::info!(table = what.table(), rows = total, "retention pruned");
        }
        pruned.push((what, total));
    }
    if pruned.iter().any(|(_, n)| *n > 0) {
        store.reclaim_space(10_000).await?;
    }
    for what in Prunable::ALL {
        let rows = store.count_rows(what).await?;
        service
            .metrics
            .store_rows
            .get_or_create(&TableLabel {
                table: what.table(),
            })
            .set(i64::try_from(rows).unwrap_or(i64::MAX));
    }
    Ok(pruned)
}

/// Runs a pass every `[retention] interval` on the leader until `shutdown`.
pub async fn run(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let worker = Worker {
        name: "retention",
        period: service.config().retention.interval,
        leader_only: true,
        first_round_at_once: true,
        wake: None,
    };
    worker
        .run(&service.tasks, &|| service.is_leader(), shutdown, || {
            let service = service.clone();
            async move {
                prune(&service, now())
                    .await
                    .map(drop)
                    .inspect_err(|_| service.store_failed("retention"))
            }
        })
        .await
}
