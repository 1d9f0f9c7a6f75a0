//! The stopped layer of the simulator's runway policies (`runway+stopped`,
//! `predictive+stopped`): `runway_core::stopped::plan`, which decides what
//! `runway serve` is to start, prepare and retire, over the simulator's
//! runners.

use runway_core::stopped::{StoppedInput, StoppedRunner};
use runway_core::{RunnerId, Timestamp};

use crate::engine::{Decision, PoolView, RunnerPhase};

/// One pool's stopped capacity this round, as `runway serve` plans it
/// (`runway_core::stopped::plan`), over the simulator's runners.
pub fn decision(view: &PoolView<'_>, expected: u32, now: i64) -> Decision {
    let policy = &view.model.stopped;
    if !policy.keeps_any() {
        return Decision::default();
    }
    let stopped: Vec<StoppedRunner> = view
        .runners
        .values()
        .filter(|r| r.phase == RunnerPhase::Stopped)
        .map(|r| StoppedRunner {
            id: RunnerId(r.id as i64),
            created_at: Timestamp::from_millis(r.created_ms),
            stopped_at: Timestamp::from_millis(r.idle_since_ms),
        })
        .collect();
    // Kept above the target until its disk has cost a boot, on the first
    // provider of the pool that can stop.
    let surplus_after = view
        .setup
        .providers_of(view.model)
        .into_iter()
        .map(|p| &view.setup.providers[p])
        .find(|p| p.resume_seconds.is_some())
        .map_or(policy.max_age, |p| {
            runway_core::stopped::surplus_after(
                p.mean_boot(),
                p.price_per_hour,
                p.stopped_price_per_hour,
                policy.max_age,
            )
        });
    let covering = view.count(RunnerPhase::Idle)
        + view.count(RunnerPhase::Booting)
        + view.count(RunnerPhase::Resuming);
    let queued = u32::try_from(view.queued.len()).unwrap_or(u32::MAX);
    let planned = runway_core::stopped::plan(
        &StoppedInput {
            policy,
            stopped: &stopped,
            preparing: view.count(RunnerPhase::Preparing),
            uncovered: queued.saturating_sub(covering),
            room: view.model.policy.max_runners.saturating_sub(view.running()),
            expected,
            surplus_after,
        },
        Timestamp::from_millis(now),
    );
    Decision {
        start: planned.start.iter().map(|id| id.0 as u64).collect(),
        prepare: view.prepare_in_preference_order(planned.prepare),
        delete: planned.retire.iter().map(|id| id.0 as u64).collect(),
        ..Decision::default()
    }
}
