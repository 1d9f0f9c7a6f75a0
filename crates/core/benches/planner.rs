//! `plan` at fleet scale: 1,000 pools, 100,000 runners, 100,000 queued jobs.
//! `cargo bench -p runway-core`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use runway_core::planner::{
    plan, Offer, PoolPolicy, PoolSnapshot, QueuedJob, RunnerView, Snapshot,
};
use runway_core::{JobId, RunnerId, RunnerState, Timestamp};

fn fleet() -> Snapshot {
    let states = [
        RunnerState::Idle,
        RunnerState::Busy,
        RunnerState::Busy,
        RunnerState::Provisioning,
        RunnerState::Busy,
    ];
    let pools = (0..1_000)
        .map(|p| PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: PoolPolicy {
                min_idle: 2,
                ..PoolPolicy::new(&format!("pool-{p}"), 150)
            },
            queued: (0..100)
                .map(|j| QueuedJob {
                    id: JobId(p * 1_000 + j),
                    enqueued_at: Timestamp::from_millis(j * 1_000),
                    attempts: u32::from(j % 17 == 0),
                })
                .collect(),
            runners: (0..100)
                .map(|r| RunnerView {
                    id: RunnerId(p * 1_000 + r),
                    provider: "sim".into(),
                    state: states[(r % 5) as usize],
                    in_doubt: false,
                    requested_at: Timestamp::from_millis(r * 2_000),
                    idle_at: Some(Timestamp::from_millis(r * 3_000)),
                    ready_by: None,
                })
                .collect(),
            offers: vec![
                Offer {
                    provider: "spot".into(),
                    key: String::new(),
                    capacity: 20,
                    price_per_hour: 0.3,
                    boot_time: Duration::from_secs(90),
                    reliability: 0.8,
                },
                Offer {
                    provider: "ondemand".into(),
                    key: String::new(),
                    capacity: 1_000,
                    price_per_hour: 1.0,
                    boot_time: Duration::from_secs(60),
                    reliability: 1.0,
                },
            ],
        })
        .collect();
    Snapshot {
        pools,
        backoffs: vec![],
    }
}

fn planner(c: &mut Criterion) {
    let snapshot = fleet();
    let now = Timestamp::from_millis(400_000);
    c.bench_function("plan/1000-pools-100k-runners-100k-jobs", |b| {
        b.iter(|| plan(&snapshot, now))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(8));
    targets = planner
}
criterion_main!(benches);
