//! The claim order is fair share, as a property: over any sequence of
//! batches queued by a few keys of different weights and of hand-outs, a
//! key with queued work never waits more than its bound of hand-outs to
//! other keys — each other key `o` gets at most `ceil(w_o / w_k) + 1`
//! between two of key `k`'s (start-time fair queueing's bound; the `+ 1`
//! is a tie at either end of the interval). With equal weights and two
//! keys that is 2. On SQLite (the rule is the same trigger on PostgreSQL,
//! and the conformance cases run both).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use runway_core::job::NewJob;
use runway_core::share::{Share, Weight};
use runway_core::{JobEvent, RunnerId};
use runway_store::Claim;

use common::{api_job, at, Harness};

#[derive(Debug, Clone)]
enum Op {
    /// Key `key` queues `count` jobs in one batch.
    Queue { key: usize, count: usize },
    /// One hand-out.
    Claim,
    /// The oldest job handed out ends (the virtual time can move back).
    Finish,
}

fn op(keys: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..keys, 1..25usize).prop_map(|(key, count)| Op::Queue { key, count }),
        5 => Just(Op::Claim),
        1 => Just(Op::Finish),
    ]
}

fn case() -> impl Strategy<Value = (Vec<u32>, Vec<Op>)> {
    prop::collection::vec(prop::sample::select(vec![1u32, 2, 3]), 2..=4).prop_flat_map(|weights| {
        let keys = weights.len();
        (Just(weights), prop::collection::vec(op(keys), 1..80))
    })
}

fn bound(weights: &[u32], key: usize) -> u32 {
    weights
        .iter()
        .enumerate()
        .filter(|(other, _)| *other != key)
        .map(|(_, w)| w.div_ceil(weights[key]) + 1)
        .sum()
}

async fn run(weights: Vec<u32>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let harness = Harness::sqlite().await;
    let store = harness.store.clone();
    let mut queued: BTreeMap<usize, usize> = BTreeMap::new();
    // Hand-outs to other keys since the key's last one (or since it had
    // queued work again).
    let mut waited: BTreeMap<usize, u32> = BTreeMap::new();
    let mut handed_out = Vec::new();
    let mut next_id = 0;
    for (step, op) in ops.into_iter().enumerate() {
        let now = at(10 + step as i64);
        match op {
            Op::Queue { key, count } => {
                let jobs: Vec<NewJob> = (0..count)
                    .map(|_| {
                        next_id += 1;
                        NewJob {
                            share: Share::new(
                                format!("key{key}"),
                                Weight::from_f64(f64::from(weights[key])).unwrap_or_default(),
                            ),
                            ..api_job(&format!("job{next_id}"), "default")
                        }
                    })
                    .collect();
                store.enqueue_many(&jobs, now).await.expect("enqueue");
                let before = queued.entry(key).or_default();
                if *before == 0 {
                    waited.insert(key, 0);
                }
                *before += count;
            }
            Op::Claim => {
                let claim = Claim {
                    pool: "default".into(),
                    runner: RunnerId(step as i64 + 1),
                    limit: 1,
                    lease: Duration::from_secs(600),
                    runner_labels: None,
                    max_running_per_key: None,
                };
                let claimed = store.claim(&claim, now).await.expect("claim");
                let Some(job) = claimed.first() else {
                    prop_assert!(queued.values().all(|n| *n == 0), "{queued:?}");
                    continue;
                };
                let key: usize = job.share.key["key".len()..].parse().expect("key");
                for (other, count) in &queued {
                    if *other != key && *count > 0 {
                        let wait = waited.entry(*other).or_default();
                        *wait += 1;
                        prop_assert!(
                            *wait <= bound(&weights, *other),
                            "key{other} (weight {}) waited {wait} hand-outs; weights {weights:?}",
                            weights[*other]
                        );
                    }
                }
                waited.insert(key, 0);
                *queued.entry(key).or_default() -= 1;
                handed_out.push(job.clone());
            }
            Op::Finish => {
                if handed_out.is_empty() {
                    continue;
                }
                let job = handed_out.remove(0);
                let ended = job
                    .apply(
                        &JobEvent::Cancel {
                            reason: "done".into(),
                        },
                        now,
                    )
                    .expect("cancel");
                prop_assert!(store.replace_job(&job, &ended).await.expect("replace"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_key_with_queued_work_waits_more_than_its_bound((weights, ops) in case()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(run(weights, ops))?;
    }
}
